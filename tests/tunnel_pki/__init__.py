"""Tests of tunnel_pki: keys, CSRs, the CA, client identities, TLS contexts, private files."""
