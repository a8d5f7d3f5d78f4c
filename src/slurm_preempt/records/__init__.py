"""The record of what happened: prolog/epilog hooks (install and check, for admins), and what is read
from the ledger afterwards (history, report, timeline)."""
