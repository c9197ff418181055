"""Monitoring, alerting, traces and logs: scrape configs, rules, dashboards, Alertmanager
routing, OpenTelemetry and the VMP remote write.
"""
