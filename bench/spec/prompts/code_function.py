def summarize_orders(orders, tax_rate, discount_codes):
    total = 0.0
    count = 0
    skipped = []
    by_customer = {}
    largest = None
    for order in orders:
        if order.get("status") == "cancelled":
            skipped.append(order["id"])
            continue
        items = order.get("items", [])
        if not items:
            skipped.append(order["id"])
            continue
        subtotal = 0.0
        for item in items:
            price = item["price"]
            quantity = item.get("quantity", 1)
            subtotal += price * quantity
        code = order.get("discount_code")
        if code in discount_codes:
            subtotal -= subtotal * discount_codes[code]
        tax = subtotal * tax_rate
        subtotal += tax
        total += subtotal
        count += 1
        customer = order["customer"]
        if customer not in by_customer:
            by_customer[customer] = {"orders": 0, "spent": 0.0}
        by_customer[customer]["orders"] += 1
        by_customer[customer]["spent"] += subtotal
        if largest is None or subtotal > largest[1]:
            largest = (order["id"], subtotal)
    average = total / count if count else 0.0
    best_customer = None
    best_spent = 0.0
    for customer, stats in by_customer.items():
        if stats["spent"] > best_spent:
            best_customer = customer
            best_spent = stats["spent"]
    report = {
        "total": round(total, 2),
        "count": count,
        "average": round(average, 2),
        "skipped": skipped,
        "best_customer": best_customer,
        "largest_order": largest,
    }
    lines = []
    lines.append("Orders processed: %d" % count)
    lines.append("Revenue: %.2f" % total)
    lines.append("Average order: %.2f" % average)
    if skipped:
        lines.append("Skipped orders: %s" % ", ".join(str(s) for s in skipped))
    if best_customer is not None:
        lines.append("Best customer: %s (%.2f)" % (best_customer, best_spent))
    if largest is not None:
        lines.append("Largest order: %s (%.2f)" % largest)
    report["text"] = "\n".join(lines)
    return report
