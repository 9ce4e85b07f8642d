"""A simulated fleet of GPU agents as one process (compose, demos): `python -m services.fleet --domains 4`."""
