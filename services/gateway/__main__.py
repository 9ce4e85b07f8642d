"""python -m services.gateway: serve the API on RACKSCALE_GATEWAY_HOST:RACKSCALE_GATEWAY_PORT."""

from services.gateway.service import GatewayService
from services.main import main_for

main_for(GatewayService)
