# inventory.py: a small stock ledger for a shop's back room.
import json
from dataclasses import dataclass, field


@dataclass
class Item:
    sku: str
    name: str
    quantity: int = 0
    price_cents: int = 0
    tags: list = field(default_factory=list)

    def value_cents(self):
        # What the shelf holds of this item, in cents.
        return self.quantity * self.price_cents


class Ledger:
    def __init__(self):
        self.items = {}

    def add(self, item):
        # A second add of the same SKU tops the stock up.
        if item.sku in self.items:
            self.items[item.sku].quantity += item.quantity
        else:
            self.items[item.sku] = item

    def remove(self, sku, quantity):
        item = self.items.get(sku)
        if item is None:
            raise KeyError(f"unknown SKU {sku}")
        if quantity > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} in stock")
        item.quantity -= quantity
        if item.quantity == 0:
            del self.items[sku]

    def total_cents(self):
        return sum(item.value_cents() for item in self.items.values())

    def tagged(self, tag):
        return [item for item in self.items.values() if tag in item.tags]

    def save(self, path):
        with open(path, "w") as f:
            json.dump({sku: vars(item) for sku, item in self.items.items()}, f, indent=2)

    @classmethod
    def load(cls, path):
        ledger = cls()
        with open(path) as f:
            for sku, fields in json.load(f).items():
                ledger.add(Item(**fields))
        return ledger


if __name__ == "__main__":
    ledger = Ledger()
    ledger.add(Item("A-1", "hammer", 4, 1299, ["tools"]))
    ledger.add(Item("B-7", "nails (100)", 30, 349, ["tools", "bulk"]))
    ledger.add(Item("C-2", "paint, white", 6, 2450))
    ledger.remove("B-7", 5)
    print(f"stock value: {ledger.total_cents() / 100:.2f}")
