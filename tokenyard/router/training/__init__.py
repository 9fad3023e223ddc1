"""Training and evaluation of the complexity classifier (`tokenyard router train`): the data,
the fit, the leave-one-domain-out report and the cost curves. Serving never imports it (an
import-linter contract); it writes the artifact that router/classifier.py loads."""
