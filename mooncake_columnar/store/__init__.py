"""The columnar state: object rows, replica slots, key index, segments. No policy here."""
