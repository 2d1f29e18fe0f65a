"""The Dagster code location `workspace.yaml` loads (and `photon run`, in process): built by
`photon/code_location.py` from the environment (PHOTON_DATA_DIR, default ./data; PHOTON_DATACENTERS)."""

from photon.code_location import definitions_from_env

defs = definitions_from_env()
