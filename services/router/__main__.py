"""python -m services.router: one front door over the cells of RACKSCALE_CELL_GATEWAYS, on
RACKSCALE_ROUTER_HOST:RACKSCALE_ROUTER_PORT."""

from services.router.service import main

main()
