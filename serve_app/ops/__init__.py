"""Operations: the app builder (Serve config -> application), Ray on this machine or a running
cluster, the `probserve` CLI, and the generators of the k8s overlays and the Grafana
dashboard. May import everything."""
