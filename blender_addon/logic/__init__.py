"""The add-on's logic that needs no Blender: the backend link and its environment, frames, datasets, colours,
placement, defaults and messages. Tested by plain pytest; imports only core/."""
