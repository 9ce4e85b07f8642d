"""inventory: registrations, heartbeats and drains in; node records and NodeChanged events out."""
