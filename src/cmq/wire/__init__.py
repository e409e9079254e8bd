"""Sans-IO core: wire format, batching and receiving, with no sockets and no clocks."""
