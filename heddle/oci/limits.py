"""The deadline of an exchange with a registry or URL, where the flag table reads it (`--transfer-timeout`)
without loading the artifact's and the HTTP stack's imports before `--help`."""

# Seconds one exchange with a registry or URL may take in all, its whole answer read (a manifest,
# a token, a bundle's download): a server that drips bytes ends here. Silence ends sooner, at the
# client's read timeout (heddle.oci.client.TIMEOUT). `--transfer-timeout` sets it.
TRANSFER_TIMEOUT_S = 600.0
