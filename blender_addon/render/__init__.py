"""Drawing splats with the scene: the render engine, the viewport overlay, the final renders' composite and the
view transform's colours. Imports scene/, logic/ and core/."""
