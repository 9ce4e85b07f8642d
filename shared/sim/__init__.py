"""Trace-driven simulator: replays GPU-cluster job traces onto a modelled fleet of NVLink domains.

It drives the very scheduling core the services use (`shared.core.Scheduler`); nothing here decides
where a job goes. Modules, one concept each:

- `traces`: loaders for the real traces and the canonical CSV (bad rows counted with their reason);
- `mapping`: how a trace job becomes an NVL72 job shape, load scaling, estimates, trace mixes;
- `fleet`: the fleet topology and seeded node failures with repair times;
- `slowdown`: the cost of an NVLink-sensitive job split across domains;
- `engine`: the discrete-event simulator (injected clock: simulated seconds only);
- `metrics`: per-run metrics and the mean/spread over seeds;
- `report`: report.json, report.md and PNG plots.
"""

from shared.core.comm import SlowdownModel
from shared.sim.engine import SimConfig, SimResult, Simulator, simulate
from shared.sim.fleet import FailureModel, FleetConfig
from shared.sim.mapping import MappingConfig, SimJob, map_jobs, scale_to_load
from shared.sim.traces import FORMATS, LoadedTrace, TraceFormatError, TraceJob, load_trace

__all__ = [
    "FORMATS",
    "FailureModel",
    "FleetConfig",
    "LoadedTrace",
    "MappingConfig",
    "SimConfig",
    "SimJob",
    "SimResult",
    "Simulator",
    "SlowdownModel",
    "TraceFormatError",
    "TraceJob",
    "load_trace",
    "map_jobs",
    "scale_to_load",
    "simulate",
]
