"""Front end ↔ executor: the messages, the framed Unix-socket channel carrying them, the
tensor descriptors (arena offsets or inline bytes), and the two ends of the seam."""
