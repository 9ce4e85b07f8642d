"""python -m services.migration"""

from services.main import main_for
from services.migration.service import MigrationService

main_for(MigrationService)
