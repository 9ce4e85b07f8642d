"""agent: one per GPU node; reports the node to inventory and runs the ranks placement sends it."""
