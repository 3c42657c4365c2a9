"""The event store: opening it, the codec, the recorders, the event log, what nodes and tokens last said."""
