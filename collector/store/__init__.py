"""The recording store (``docs/recording.md``), one job per module: ``codec`` turns an interval
document into a checksummed record and a record's payload back into arrays; ``writer`` appends
records to the segments of a directory it holds locked, with retention; ``reader`` reads a
directory back, skipping and reporting whatever is damaged, as documents or arrays."""
