"""What the user sees: the sidebar's panels and their kit, the scene's settings and the add-on's preferences.
Imports every layer below."""
