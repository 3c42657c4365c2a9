"""The service layer: every command and query of the control plane, one module per aggregate family."""
