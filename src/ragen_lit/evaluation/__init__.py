"""`python -m ragen_lit evaluate`: how well a policy plays, measured on fixed episodes.

`estimators` holds the statistics (pass@k, the success rate's interval), `policy` loads the model a reference
names, `report` summarizes one environment's episodes, `record` writes the JSON report and the MLflow runs, and
`run` is the command (its module docstring says which episodes are played and how).
"""
