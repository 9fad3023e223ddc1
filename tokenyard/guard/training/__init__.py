"""Training and evaluation of the safety classifiers (`tokenyard guard train`): the labelled
rows, the fit with its held-out and leave-one-source-out evaluation, and the report. Serving
never imports it (an import-linter contract); it writes the artifact guard/classifier.py loads."""
