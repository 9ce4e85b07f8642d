"""python -m services.inventory"""

from services.inventory.service import InventoryService
from services.main import main_for

main_for(InventoryService)
