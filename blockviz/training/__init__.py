"""The training side: the only code that imports torch and Lightning."""
