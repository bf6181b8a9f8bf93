"""The operators, one module per feature; they share base.py only. Import render/, scene/, logic/ and core/."""
