"""The robust-settings report of a sweep (`nalu-sweep report`); see build.py."""
