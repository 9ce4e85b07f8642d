"""The media types a job file travels under on POST /v1/jobs (besides JSON): the gateway reads by them, the
router routes by them, the CLI and the Python client send them."""

YAML = "application/yaml"
SCRIPT = "text/x-shellscript"
YAML_TYPES = frozenset({YAML, "application/x-yaml", "text/yaml", "text/x-yaml"})
SCRIPT_TYPES = frozenset({SCRIPT, "application/x-sh", "text/x-sh"})
