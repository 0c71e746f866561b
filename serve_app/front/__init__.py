"""The front door: the ingress deployment, which only wires parse -> admit -> send -> shape,
and its HTTP plumbing and replica client. Imports every layer below `ops`."""
