"""mooncake-columnar: a columnar object-metadata engine for a Mooncake Store master."""
