"""What every job of the proxy layer shares: the client side of an exchange, the Exchange and Tunnel records,
the events, the refusal a connection ends with, the passage headers and the optional transports."""
