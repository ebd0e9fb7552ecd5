"""Reading finished runs back from MLflow and comparing them: `runs` loads, `stats` summarises, `compare`
builds the table and the figures behind `python -m ragen_lit compare`."""
