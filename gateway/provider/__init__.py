"""provider."""
