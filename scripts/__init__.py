"""Set-up and run scripts: the README's two commands and what they share."""
