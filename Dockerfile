# One image for every Rackscale service; the command picks the service (see docker-compose.yml):
#   python -m services.gateway | services.queue | services.placement | services.inventory | services.migration
#   python -m services.agent --backend nvml      (a GPU node; the NVML extra is installed)
#   python -m services.fleet --domains 4         (simulated agents)
#   rackscale ...                                (the CLI)
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install ".[nvml]" && useradd --system --uid 10001 rackscale
USER rackscale
# containers must listen beyond loopback; NATS/Redis URLs come from the deployment
ENV RACKSCALE_GATEWAY_HOST=0.0.0.0
EXPOSE 8080 9090
CMD ["python", "-m", "services.gateway"]
