"""The Compare page's parts: the run selection, the curves, the final metrics, gradient by
layer, the twins, the config differences and the report."""
