"""Grafana root-cause dashboards as code, and their provisioning."""
