"""Figure builders: plain functions of analysis tables (timeline, charts)."""
