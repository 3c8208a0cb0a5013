"""Reference trading core: protocol codecs, order book, exchange simulator, feed and gateway."""
