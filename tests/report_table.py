"""Formats rewrite reports with equarx.format_report (run by
tests/report_table.rs with PYTHONPATH=python): `report_table.py OUT
REPORT.json...` writes the tables, one per report, as a JSON list to OUT."""

import json
import sys

import equarx

tables = [equarx.format_report(json.load(open(path))) for path in sys.argv[2:]]
with open(sys.argv[1], "w") as f:
    json.dump(tables, f)
