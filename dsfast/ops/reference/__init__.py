"""Pure-torch stand-ins for the native ops: same functions, same arguments, slower."""
