"""python -m services.queue"""

from services.main import main_for
from services.queue.service import QueueService

main_for(QueueService)
