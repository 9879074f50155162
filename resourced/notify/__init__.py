"""The resourced-notify service: desktop notifications of health levels and the calendar."""
