"""Object stores: bodies of large objects on a filesystem, in S3, or in memory for tests."""
