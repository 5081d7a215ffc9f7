"""A study's views: charts, results table, text and its zip."""
