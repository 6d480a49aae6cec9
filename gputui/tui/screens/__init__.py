"""The app's screens: set-up, run, and the modal dialogs."""
