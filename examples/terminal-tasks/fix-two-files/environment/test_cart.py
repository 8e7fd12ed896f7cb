from cart import total
from prices import with_tax

assert with_tax(1000, "food") == 1100
assert with_tax(1005, "food") == 1106, with_tax(1005, "food")  # 1105.5 rounds up
assert with_tax(400, "books") == 400
assert total([(1000, "food", 2), (400, "books", 1)]) == 2600, total([(1000, "food", 2), (400, "books", 1)])
print("all tests pass")
