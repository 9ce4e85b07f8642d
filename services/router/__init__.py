"""The router: one HTTP front door over several scheduling cells' gateways (docs/operations.md, "Cells")."""
