// A fixture for the ctest layering_rejects_upward: a source file at core/'s root, outside every stage.
