"""Export: charts to files, reports, tables, a run as code (torch-free)."""
