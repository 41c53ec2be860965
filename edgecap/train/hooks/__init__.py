"""The training hooks variants name (edgecap.train.hook): one module each, found by the
registry, so a new one is a new module here and no list names it."""
