"""Table schemas and atomic parquet I/O for the index folder."""
