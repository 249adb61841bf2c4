"""client_tools."""
