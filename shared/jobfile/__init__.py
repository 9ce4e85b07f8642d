"""Job files: a job body in YAML, and sbatch scripts (`#SBATCH` and `#RACKSCALE` lines) — read into the JSON-able
body POST /v1/jobs takes, with the line each field came from. Pure: text in, a `JobFile` or a `JobFileError` naming
the line out. The gateway (YAML and script request bodies) and the CLI (`rackscale submit -f`, `rackscale sbatch`)
both read with this one reader; the body is then validated as a JSON submit is. docs/jobs.md says it all for users.
"""

from shared.jobfile.errors import COMMAND_LINE, JobFileError
from shared.jobfile.jobfile import JobFile
from shared.jobfile.media import SCRIPT, SCRIPT_TYPES, YAML, YAML_TYPES
from shared.jobfile.sbatch import SCRIPT_MAX_BYTES, command_line_words, load_script_text, parse_script
from shared.jobfile.yaml_job import load_yaml_text, parse_yaml

__all__ = [
    "COMMAND_LINE",
    "SCRIPT",
    "SCRIPT_MAX_BYTES",
    "SCRIPT_TYPES",
    "YAML",
    "YAML_TYPES",
    "JobFile",
    "JobFileError",
    "command_line_words",
    "load_script_text",
    "load_yaml_text",
    "parse_script",
    "parse_yaml",
]
