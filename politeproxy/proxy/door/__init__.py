"""The client's door: the proxy port's connections, read by the one server protocol; CONNECTs intercepted or
tunnelled."""
