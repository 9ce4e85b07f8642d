"""python -m services.placement"""

from services.main import main_for
from services.placement.service import PlacementService

main_for(PlacementService)
