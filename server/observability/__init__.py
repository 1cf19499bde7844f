"""What the server reports about itself: statistics (and later metrics)."""
